-- zapstream outbox: send intents written in the application's own transaction.
--
-- Applications in any language may INSERT directly; the outbox article's own
-- statement works unchanged:
--   INSERT INTO outbox_jobs (instance_id, payload, idempotency_key) VALUES ($1, $2, $3)
-- with payload {"type":"text","to":...,"text":...}. Every other column has a
-- default or is derived by the trigger below. The table deliberately accepts
-- malformed payloads: the relay publishes them to zapstream.invalid with the
-- reason instead of losing them or rejecting the application's transaction.

CREATE TABLE IF NOT EXISTS outbox_jobs (
    id               BIGSERIAL PRIMARY KEY,
    instance_id      TEXT        NOT NULL,
    payload          JSONB       NOT NULL,
    status           TEXT        NOT NULL DEFAULT 'PENDING',
    attempts         INTEGER     NOT NULL DEFAULT 0,
    max_attempts     INTEGER     NOT NULL DEFAULT 5 CHECK (max_attempts > 0),
    next_retry_at    TIMESTAMPTZ,
    last_error       TEXT,
    idempotency_key  TEXT        NOT NULL UNIQUE,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    sent_at          TIMESTAMPTZ,
    conversation_key TEXT,
    priority         TEXT        NOT NULL DEFAULT 'operational',
    purpose          TEXT,
    expires_at       TIMESTAMPTZ,
    gateway_job_id   TEXT,
    state_version    INTEGER     NOT NULL DEFAULT 0,
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS outbox_jobs_status_idx ON outbox_jobs (status, updated_at);
CREATE INDEX IF NOT EXISTS outbox_jobs_instance_idx ON outbox_jobs (instance_id, created_at);

CREATE TABLE IF NOT EXISTS outbox_job_events (
    id          BIGSERIAL PRIMARY KEY,
    job_id      BIGINT      NOT NULL REFERENCES outbox_jobs (id) ON DELETE CASCADE,
    from_status TEXT,
    to_status   TEXT        NOT NULL,
    version     INTEGER     NOT NULL,
    actor       TEXT        NOT NULL,
    reason      TEXT,
    at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (job_id, version)
);

-- The conversation a message belongs to, when the application did not say:
-- the recipient's digits for a phone number or a personal JID
-- (5511987654321@s.whatsapp.net, @c.us), the whole JID, lower-cased, for a group
-- (@g.us). Must agree with connectors/recipients.py:conversation_key_for.
CREATE OR REPLACE FUNCTION zapstream_conversation_key(recipient TEXT) RETURNS TEXT
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN recipient IS NULL THEN NULL
        WHEN lower(btrim(recipient)) LIKE '%@g.us' THEN lower(btrim(recipient))
        ELSE nullif(regexp_replace(split_part(recipient, '@', 1), '\D', '', 'g'), '')
    END
$$;

CREATE OR REPLACE FUNCTION zapstream_outbox_defaults() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.conversation_key IS NULL AND jsonb_typeof(NEW.payload) = 'object' THEN
        NEW.conversation_key := zapstream_conversation_key(NEW.payload ->> 'to');
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS outbox_jobs_defaults ON outbox_jobs;
CREATE TRIGGER outbox_jobs_defaults BEFORE INSERT ON outbox_jobs
    FOR EACH ROW EXECUTE FUNCTION zapstream_outbox_defaults();
