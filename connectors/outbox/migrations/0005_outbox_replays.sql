-- zapstream restream: re-publish outbox jobs the relay never streamed.
--
-- A row committed while no replication slot existed (before the first
-- `zapstream db migrate` that creates it, or while an operator had dropped
-- it) is never decoded, so it stays PENDING for ever. `zapstream outbox
-- restream --older-than 10m` copies such jobs into this table, in job id
-- order and in one transaction; the relay streams each row (CDC, like any
-- outbox insert) as the job's own IntentCaptured. The relay stays the only
-- writer to Kafka, and the worker drops a replay of a job it already handled.
--
-- The copies of the job's columns are the job's at the time of the replay.

CREATE TABLE IF NOT EXISTS outbox_replays (
    id               BIGSERIAL PRIMARY KEY,
    job_id           BIGINT      NOT NULL REFERENCES outbox_jobs (id),
    reason           TEXT        NOT NULL,
    actor            TEXT        NOT NULL DEFAULT 'operator',
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    instance_id      TEXT        NOT NULL,
    idempotency_key  TEXT        NOT NULL,
    conversation_key TEXT,
    payload          JSONB       NOT NULL,
    priority         TEXT        NOT NULL,
    purpose          TEXT,
    expires_at       TIMESTAMPTZ,
    max_attempts     INTEGER     NOT NULL,
    job_created_at   TIMESTAMPTZ NOT NULL
);

CREATE INDEX IF NOT EXISTS outbox_replays_job_idx ON outbox_replays (job_id, created_at);

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
        EXECUTE format('ALTER PUBLICATION %I ADD TABLE outbox_replays', pub.pubname);
    END LOOP;
END
$$;
