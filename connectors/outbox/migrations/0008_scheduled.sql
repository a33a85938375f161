-- zapstream scheduled sends: a job due later waits in PostgreSQL, not in Kafka.
--
-- The outbox article schedules a message by inserting it with next_retry_at in
-- the future; so does enqueue(..., send_at=...). The trigger below marks such a
-- row SCHEDULED (not PENDING: the article's stuck-jobs query does not count it).
-- The relay publishes nothing for a SCHEDULED row; the active relay's release
-- loop (connectors/cdc/scheduled_release.py) releases due jobs in bounded batches,
-- each batch one transaction: the jobs become PENDING and their copies go into
-- outbox_replays, which the relay streams as the jobs' own intents, so priority,
-- pacing, expiry and cancel apply as to any job.
--
--   INSERT INTO outbox_jobs (instance_id, payload, idempotency_key, next_retry_at)
--       VALUES ('clinic-1', '{"type":"text","to":"5511987654321","text":"..."}',
--               'visit-42-d1', '2026-03-09 09:00-03');
--
-- Reschedule (a job not released yet):
--   UPDATE outbox_jobs SET next_retry_at = '2026-03-09 10:00-03'
--       WHERE id = 42 AND status = 'SCHEDULED';
--   SELECT zapstream_reschedule(42, '2026-03-09 10:00-03');  -- raises if released

-- Only the waiting jobs: the release reads due ones in (due, id) order.
CREATE INDEX IF NOT EXISTS outbox_jobs_scheduled_idx ON outbox_jobs (next_retry_at, id)
    WHERE status = 'SCHEDULED';

-- A row inserted PENDING with next_retry_at after the transaction's start is
-- scheduled. (Fires after outbox_jobs_defaults: triggers of one event run in name order.)
CREATE OR REPLACE FUNCTION zapstream_outbox_schedule() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'PENDING' AND NEW.next_retry_at IS NOT NULL AND NEW.next_retry_at > now() THEN
        NEW.status := 'SCHEDULED';
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS outbox_jobs_schedule ON outbox_jobs;
CREATE TRIGGER outbox_jobs_schedule BEFORE INSERT ON outbox_jobs
    FOR EACH ROW EXECUTE FUNCTION zapstream_outbox_schedule();

-- Move a scheduled job to another time; returns the new time. A job already
-- released (or cancelled, or never scheduled) is refused with its status.
CREATE OR REPLACE FUNCTION zapstream_reschedule(p_job_id BIGINT, p_send_at TIMESTAMPTZ)
RETURNS TIMESTAMPTZ
LANGUAGE plpgsql AS $$
DECLARE
    current_status TEXT;
BEGIN
    IF p_send_at IS NULL THEN
        RAISE EXCEPTION 'zapstream: a reschedule needs the new time'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    UPDATE outbox_jobs SET next_retry_at = p_send_at, updated_at = now()
        WHERE id = p_job_id AND status = 'SCHEDULED';
    IF FOUND THEN
        RETURN p_send_at;
    END IF;
    SELECT status INTO current_status FROM outbox_jobs WHERE id = p_job_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'zapstream: no outbox job with id %', p_job_id
            USING ERRCODE = 'no_data_found';
    END IF;
    RAISE EXCEPTION 'zapstream: job % is %, not SCHEDULED: only a job not released yet can be rescheduled',
        p_job_id, current_status
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'cancel it and enqueue a new job with send_at';
END
$$;
