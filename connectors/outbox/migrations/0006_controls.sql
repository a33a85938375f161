-- zapstream controls: operators pause and resume a WhatsApp instance or a campaign.
--
-- A control is a row INSERTed into outbox_controls, insert-only by convention
-- (never UPDATE or DELETE one: the table is the history of who paused what and
-- why). The relay streams each row (CDC, like an intent or a command) to Kafka
-- as a ControlChanged on zapstream.controls, keyed by "<kind>:<target>"; the
-- worker holds the instance's, or the campaign's, messages while paused.
--
--   SELECT zapstream_pause('instance', 'shop-1', 'number flagged by Meta', 'alice');
--   SELECT zapstream_resume('campaign', 'black-friday', 'copy approved', 'bob');
--   SELECT * FROM zapstream_controls;          -- the latest action per target
--
-- A campaign is named by the `purpose` its jobs were enqueued with.
--
-- Backpressure to producers: zapstream_backlog() says how much is waiting, per
-- instance, purpose and priority, and how old the oldest waiting message is;
-- zapstream_should_hold(instance, max_age_s) is true when the instance's oldest
-- waiting operational message is older than the business limit, the moment to
-- suspend producers (stop enqueueing bulk work) until it drains.

CREATE TABLE IF NOT EXISTS outbox_controls (
    id         BIGSERIAL PRIMARY KEY,
    kind       TEXT        NOT NULL CHECK (kind IN ('instance', 'campaign')),
    target     TEXT        NOT NULL CHECK (btrim(target) <> ''),
    action     TEXT        NOT NULL CHECK (action IN ('pause', 'resume')),
    reason     TEXT        NOT NULL CHECK (btrim(reason) <> ''),
    actor      TEXT        NOT NULL CHECK (btrim(actor) <> ''),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS outbox_controls_target_idx
    ON outbox_controls (kind, target, id DESC);

-- The latest action per (kind, target): paused when it is 'pause'.
CREATE OR REPLACE VIEW zapstream_controls AS
    SELECT DISTINCT ON (kind, target)
           kind, target, action, action = 'pause' AS paused, reason, actor,
           created_at AS at, id AS control_id
    FROM outbox_controls
    ORDER BY kind, target, id DESC;

CREATE OR REPLACE FUNCTION zapstream_pause(
    p_kind TEXT, p_target TEXT, p_reason TEXT, p_actor TEXT DEFAULT 'application'
) RETURNS BIGINT
LANGUAGE sql AS $$
    INSERT INTO outbox_controls (kind, target, action, reason, actor)
    VALUES (p_kind, btrim(p_target), 'pause', btrim(p_reason), btrim(coalesce(p_actor, 'application')))
    RETURNING id
$$;

CREATE OR REPLACE FUNCTION zapstream_resume(
    p_kind TEXT, p_target TEXT, p_reason TEXT, p_actor TEXT DEFAULT 'application'
) RETURNS BIGINT
LANGUAGE sql AS $$
    INSERT INTO outbox_controls (kind, target, action, reason, actor)
    VALUES (p_kind, btrim(p_target), 'resume', btrim(p_reason), btrim(coalesce(p_actor, 'application')))
    RETURNING id
$$;

-- Jobs not settled yet (the worker has not finished with them). Partial, so its
-- size follows the backlog, not the table's history: zapstream_backlog reads
-- only this index, and zapstream_should_hold one entry of it.
CREATE INDEX IF NOT EXISTS outbox_jobs_unsettled_idx
    ON outbox_jobs (instance_id, priority, created_at) INCLUDE (purpose)
    WHERE status IN ('PENDING', 'RETRY_WAIT', 'ATTEMPTING');

-- What is waiting, per instance, purpose and priority, optionally for one
-- instance and/or one purpose: how many jobs, and the age in seconds of the
-- oldest (by created_at, on the database's clock).
CREATE OR REPLACE FUNCTION zapstream_backlog(
    p_instance TEXT DEFAULT NULL, p_purpose TEXT DEFAULT NULL
) RETURNS TABLE (
    instance_id TEXT, purpose TEXT, priority TEXT,
    waiting BIGINT, oldest_waiting_age_s DOUBLE PRECISION
)
LANGUAGE sql STABLE AS $$
    SELECT j.instance_id, j.purpose, j.priority, count(*),
           extract(epoch FROM now() - min(j.created_at))::double precision
    FROM outbox_jobs j
    WHERE j.status IN ('PENDING', 'RETRY_WAIT', 'ATTEMPTING')
      AND (p_instance IS NULL OR j.instance_id = p_instance)
      AND (p_purpose IS NULL OR j.purpose = p_purpose)
    GROUP BY j.instance_id, j.purpose, j.priority
    ORDER BY j.instance_id, j.priority, j.purpose
$$;

-- The seed's "suspend producers when the oldest waiting message is older than
-- the business limit": true when the instance's oldest waiting operational
-- message was created more than p_max_age_s seconds ago. Bulk producers call it
-- before enqueueing more, and wait while it is true.
CREATE OR REPLACE FUNCTION zapstream_should_hold(p_instance TEXT, p_max_age_s DOUBLE PRECISION)
RETURNS BOOLEAN
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT extract(epoch FROM now() - j.created_at) > p_max_age_s
         FROM outbox_jobs j
         WHERE j.instance_id = p_instance
           AND j.priority = 'operational'
           AND j.status IN ('PENDING', 'RETRY_WAIT', 'ATTEMPTING')
         ORDER BY j.created_at
         LIMIT 1),
        false)
$$;

-- Add the table to an existing zapstream publication (the relay or `db migrate`
-- does it too, for publications created later).
DO $$
DECLARE
    pub record;
BEGIN
    FOR pub IN
        SELECT p.pubname FROM pg_publication p
        JOIN pg_publication_tables t ON t.pubname = p.pubname
        WHERE t.tablename = 'outbox_jobs' AND t.schemaname = current_schema()
    LOOP
        EXECUTE format('ALTER PUBLICATION %I ADD TABLE outbox_controls', pub.pubname);
    END LOOP;
END
$$;
