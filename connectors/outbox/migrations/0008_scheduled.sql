-- zapstream scheduled sends: a job due later waits in PostgreSQL, not in Kafka.
--
-- The outbox article schedules a message by inserting it with next_retry_at in
-- the future; so does enqueue(..., send_at=...). The trigger below marks such a
-- row SCHEDULED (not PENDING: the article's stuck-jobs query does not count it).
-- The relay publishes nothing for a SCHEDULED row; the active relay's release
-- loop (connectors/cdc/scheduled_release.py) calls zapstream_release_due() below:
-- due jobs, in bounded batches, each batch one transaction, become PENDING and
-- their copies go into outbox_replays, which the relay streams as the jobs' own
-- intents, so priority, pacing, expiry and cancel apply as to any job.
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

-- Release at most p_batch due jobs in one transaction; returns how many. In
-- (next_retry_at, id) order, by the partial index; a job with a cancel command is
-- never released (the worker settles it CANCELLED); a row locked by another
-- transaction (being rescheduled) waits for the next call. SECURITY DEFINER: the
-- relay's role may run this and nothing else that writes (roles.py), and never
-- reads a payload itself.
-- Released jobs the worker has not attempted yet, per instance (the release's brake).
CREATE INDEX IF NOT EXISTS outbox_jobs_released_idx ON outbox_jobs (instance_id)
    WHERE status = 'PENDING' AND next_retry_at IS NOT NULL;

CREATE OR REPLACE FUNCTION zapstream_release_due(p_batch INTEGER) RETURNS INTEGER
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    released INTEGER;
BEGIN
    -- Tells outbox_jobs_scheduled_writes below that this is the release.
    PERFORM set_config('zapstream.releasing', 'on', true);
    WITH busy AS (
        -- Instances with two batches released and not yet attempted (PENDING, with the
        -- time they were due): their next jobs wait in PostgreSQL until the worker caught
        -- up. A crowd due at once then enters the stream as fast as pacing sends it,
        -- never as a flood the worker must read, park and re-read while an instance's
        -- operational messages wait behind it. By outbox_jobs_released_idx.
        SELECT r.instance_id
        FROM outbox_jobs r
        WHERE r.status = 'PENDING' AND r.next_retry_at IS NOT NULL
        GROUP BY r.instance_id
        HAVING count(*) >= 2 * greatest(p_batch, 1)
    ), due AS (
        SELECT j.id
        FROM outbox_jobs j
        WHERE j.status = 'SCHEDULED' AND j.next_retry_at <= now()
          AND j.instance_id NOT IN (SELECT instance_id FROM busy)
          AND NOT EXISTS (
              SELECT 1 FROM outbox_commands c WHERE c.job_id = j.id AND c.command = 'cancel'
          )
        ORDER BY j.next_retry_at, j.id
        LIMIT greatest(p_batch, 0)
        FOR UPDATE OF j SKIP LOCKED
    ), moved AS (
        UPDATE outbox_jobs j
        SET status = 'PENDING', updated_at = now()
        FROM due
        WHERE j.id = due.id AND j.status = 'SCHEDULED'
        RETURNING j.id, j.next_retry_at, j.instance_id, j.idempotency_key, j.conversation_key,
                  j.payload, j.priority, j.purpose, j.expires_at, j.max_attempts, j.created_at
    )
    INSERT INTO outbox_replays (job_id, reason, actor, instance_id, idempotency_key,
        conversation_key, payload, priority, purpose, expires_at, max_attempts, job_created_at)
    SELECT m.id, 'scheduled: due', 'scheduler', m.instance_id, m.idempotency_key,
        m.conversation_key, m.payload, m.priority, m.purpose, m.expires_at, m.max_attempts,
        m.created_at
    FROM moved m
    ORDER BY m.next_retry_at, m.id;
    GET DIAGNOSTICS released = ROW_COUNT;
    PERFORM set_config('zapstream.releasing', '', true);
    RETURN released;
END
$$;

-- A SECURITY DEFINER function resolves names in the outbox's schema only.
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION zapstream_release_due(INTEGER) SET search_path = %I, pg_temp',
        current_schema());
END
$$;
REVOKE ALL ON FUNCTION zapstream_release_due(INTEGER) FROM PUBLIC;

-- A SCHEDULED job leaves that state only by its release (above), a reschedule keeps it,
-- and the worker's own moves (the sink: state_version changes) apply as ever. Any other
-- status write, e.g. the article's `SET status = 'PENDING'` to send it now, would leave
-- it PENDING with nothing streamed: refused, naming what to do instead.
CREATE OR REPLACE FUNCTION zapstream_outbox_scheduled_write() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('zapstream.releasing', true), '') = 'on' THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'zapstream: job % is SCHEDULED (due %): it is released when due; to send '
        'it now, move its time: SELECT zapstream_reschedule(%, now())', OLD.id,
        OLD.next_retry_at, OLD.id
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'cancel it with SELECT zapstream_cancel(idempotency_key, reason)';
END
$$;

DROP TRIGGER IF EXISTS outbox_jobs_scheduled_writes ON outbox_jobs;
CREATE TRIGGER outbox_jobs_scheduled_writes
    BEFORE UPDATE OF status ON outbox_jobs
    FOR EACH ROW
    WHEN (OLD.status = 'SCHEDULED' AND NEW.status IS DISTINCT FROM OLD.status
          AND NEW.state_version IS NOT DISTINCT FROM OLD.state_version)
    EXECUTE FUNCTION zapstream_outbox_scheduled_write();
