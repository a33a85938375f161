-- zapstream commands: cancel and reprocess requests on outbox jobs.
--
-- A command is a row INSERTed into outbox_commands in the caller's own
-- transaction, like an intent. The relay streams it (CDC) to Kafka as a
-- CommandRequested record keyed by the job's conversation, so the worker sees
-- it in order with the job's intent; the worker applies it and records the
-- outcome, with who and why, in outbox_job_events.
--
-- Applications name the job by its idempotency key, operators by its id:
--   INSERT INTO outbox_commands (idempotency_key, command, reason)
--       VALUES ('order-1', 'cancel', 'customer cancelled');
--   INSERT INTO outbox_commands (job_id, command, reason, actor)
--       VALUES (42, 'reprocess', 'gateway outage is over', 'alice');
--   SELECT zapstream_cancel('order-1', 'customer cancelled');
-- The trigger below fills in the other of the two and copies the job's columns
-- into the row: the relay sees only this row, and a reprocess must resend the
-- job exactly as it was enqueued. A command for an unknown job raises an error,
-- so nothing is written.

CREATE TABLE IF NOT EXISTS outbox_commands (
    id               BIGSERIAL PRIMARY KEY,
    job_id           BIGINT      NOT NULL REFERENCES outbox_jobs (id),
    idempotency_key  TEXT        NOT NULL,
    command          TEXT        NOT NULL CHECK (command IN ('cancel', 'reprocess')),
    reason           TEXT        NOT NULL CHECK (btrim(reason) <> ''),
    actor            TEXT        NOT NULL DEFAULT 'application' CHECK (btrim(actor) <> ''),
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Copies of the job's columns at the time of the command, always set by the
    -- trigger (NOT NULL is checked after BEFORE triggers, so callers omit them).
    instance_id      TEXT        NOT NULL,
    conversation_key TEXT,
    payload          JSONB       NOT NULL,
    priority         TEXT        NOT NULL,
    purpose          TEXT,
    expires_at       TIMESTAMPTZ,
    max_attempts     INTEGER     NOT NULL,
    job_created_at   TIMESTAMPTZ NOT NULL
);

CREATE INDEX IF NOT EXISTS outbox_commands_job_idx ON outbox_commands (job_id, created_at);

CREATE OR REPLACE FUNCTION zapstream_command_copy_job() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    job outbox_jobs%ROWTYPE;
BEGIN
    IF NEW.idempotency_key IS NOT NULL THEN
        SELECT * INTO job FROM outbox_jobs WHERE idempotency_key = NEW.idempotency_key;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'zapstream: no outbox job with idempotency_key %', NEW.idempotency_key
                USING ERRCODE = 'no_data_found',
                      HINT = 'a command must name a job that exists in outbox_jobs';
        END IF;
        IF NEW.job_id IS NOT NULL AND NEW.job_id <> job.id THEN
            RAISE EXCEPTION 'zapstream: idempotency_key % belongs to job %, not to job %',
                NEW.idempotency_key, job.id, NEW.job_id
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    ELSIF NEW.job_id IS NOT NULL THEN
        SELECT * INTO job FROM outbox_jobs WHERE id = NEW.job_id;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'zapstream: no outbox job with id %', NEW.job_id
                USING ERRCODE = 'no_data_found',
                      HINT = 'a command must name a job that exists in outbox_jobs';
        END IF;
    ELSE
        RAISE EXCEPTION 'zapstream: a command needs the job''s idempotency_key or job_id'
            USING ERRCODE = 'not_null_violation';
    END IF;

    -- Always overwrite the copies: they must be the job's, whatever the caller wrote.
    NEW.job_id := job.id;
    NEW.idempotency_key := job.idempotency_key;
    NEW.instance_id := job.instance_id;
    NEW.conversation_key := job.conversation_key;
    NEW.payload := job.payload;
    NEW.priority := job.priority;
    NEW.purpose := job.purpose;
    NEW.expires_at := job.expires_at;
    NEW.max_attempts := job.max_attempts;
    NEW.job_created_at := job.created_at;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS outbox_commands_copy_job ON outbox_commands;
CREATE TRIGGER outbox_commands_copy_job BEFORE INSERT ON outbox_commands
    FOR EACH ROW EXECUTE FUNCTION zapstream_command_copy_job();

-- Cancel the job with this idempotency key; returns the command id.
CREATE OR REPLACE FUNCTION zapstream_cancel(
    p_idempotency_key TEXT, p_reason TEXT, p_actor TEXT DEFAULT 'application'
) RETURNS BIGINT
LANGUAGE sql AS $$
    INSERT INTO outbox_commands (idempotency_key, command, reason, actor)
    VALUES (p_idempotency_key, 'cancel', p_reason, coalesce(p_actor, 'application'))
    RETURNING id
$$;
