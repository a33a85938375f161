-- zapstream: the outbox article's own UPDATEs on outbox_jobs do what they say, or say why not.
--
-- The article ("Outbox pattern no WhatsApp") teaches three writes on outbox_jobs.
-- Without this trigger each one was accepted and did nothing (zapstream's worker
-- never reads a status written by SQL), or worse:
--
--   * its FAQ's reprocess of a DEAD job,
--       UPDATE outbox_jobs SET status = 'PENDING', attempts = 0, next_retry_at = NOW() WHERE id = ?
--     becomes what `zapstream jobs reprocess <id>` does: one 'reprocess' row in
--     outbox_commands (streamed to the worker like the CLI's), with actor = the
--     database role (current_user) and the reason from the session setting
--     zapstream.reason (SET LOCAL zapstream.reason = 'gateway fixed'), else a default
--     that says it came from SQL. The row keeps its settled status, attempts and
--     next_retry_at: the worker's answer moves it (events in outbox_job_events, with
--     the command's id). A NOTICE says so. The policy is the CLI's
--     (connectors/ops/actions.py, delivery_risk.py): only DEAD, FAILED and UNCERTAIN
--     jobs are reprocessed, and one that may already have been delivered is refused
--     with the command that asks for that confirmation (`--yes`);
--   * its worker's writes, UPDATE ... SET status = 'SENT', sent_at = NOW() and the
--     failure UPDATE of status, attempts, next_retry_at and last_error, are refused:
--     zapstream's worker sends these rows, and a second worker would send twice.
--
-- Whose write is whose: the state sink (and only it) moves state_version up with
-- every state it writes; an application never changes it, and no role but the
-- sink's and the owner's may (column grants, connectors/outbox/roles.py). So a write
-- that leaves state_version alone is not the sink's. The trigger runs as the
-- updating role (no SECURITY DEFINER): the application's role needs SELECT on the
-- job's events for the delivery check, and INSERT into outbox_commands, which it has.
--
-- Narrow on purpose: it fires only on UPDATEs that name status, attempts,
-- last_error or sent_at and change one of them without moving state_version, and
-- only for rows in a state of streams/kernel/state_machine.py. Writes of other
-- columns (next_retry_at alone, the pruner's payload) and statuses another
-- migration adds are left alone. The status lists below are the state machine's
-- (tests/unit/connectors/outbox/test_article_statements.py checks that they agree).
--
-- SQLSTATEs: 42501 insufficient_privilege for a write that belongs to zapstream's
-- worker; 55000 object_not_in_prerequisite_state for a reprocess the job's state
-- does not allow.

-- Why a resend of this job may duplicate a message its recipient already has, or
-- NULL when every attempt of it ended definitively undelivered. The SQL twin of
-- connectors/ops/delivery_risk.py (same rule, same words), read from the job's
-- structured history, never from reason text.
CREATE OR REPLACE FUNCTION zapstream_delivery_risk(p_job_id BIGINT) RETURNS TEXT
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_status TEXT;
    v_event RECORD;
    v_open BOOLEAN := false;
BEGIN
    SELECT j.status INTO v_status FROM outbox_jobs j WHERE j.id = p_job_id;
    IF v_status = 'UNCERTAIN' THEN
        RETURN 'the outcome of this job''s last attempt is UNCERTAIN';
    END IF;
    IF v_status = 'ATTEMPTING' THEN
        RETURN 'an attempt of this job started and its outcome was never recorded';
    END IF;
    FOR v_event IN
        SELECT e.from_status, e.to_status FROM outbox_job_events e
        WHERE e.job_id = p_job_id ORDER BY e.version
    LOOP
        IF v_event.to_status = 'UNCERTAIN' THEN
            RETURN 'an earlier attempt of this job ended UNCERTAIN (its outcome was never known)';
        END IF;
        IF v_event.to_status = 'REVIEW' THEN
            RETURN 'the gateway took this job and reported a status this pipeline does not know '
                   '(REVIEW)';
        END IF;
        IF v_event.to_status IN ('DELIVERED', 'READ') THEN
            RETURN 'a receipt said this job was DELIVERED';
        END IF;
        CONTINUE WHEN v_event.from_status IS NOT DISTINCT FROM v_event.to_status;  -- a note
        IF v_open AND v_event.from_status IS DISTINCT FROM 'ATTEMPTING' THEN
            RETURN 'an attempt of this job started and its outcome was never recorded';
        END IF;
        v_open := v_event.to_status = 'ATTEMPTING';
    END LOOP;
    IF v_open THEN
        RETURN 'an attempt of this job started and its outcome was never recorded';
    END IF;
    RETURN NULL;
END
$$;

-- The article's FAQ reprocess, as a command; the job's row keeps its settled columns.
CREATE OR REPLACE FUNCTION zapstream_reprocess_by_update(old_job outbox_jobs, new_job outbox_jobs)
RETURNS outbox_jobs
LANGUAGE plpgsql AS $$
DECLARE
    v_risk TEXT;
    v_reason TEXT;
    v_command_id BIGINT;
BEGIN
    IF NOT old_job.status = ANY (ARRAY['DEAD', 'FAILED', 'UNCERTAIN']) THEN
        RAISE EXCEPTION 'zapstream: job % is %, and only DEAD, FAILED or UNCERTAIN jobs are '
            'reprocessed (`zapstream jobs reprocess` refuses it too): to send the message again, '
            'insert a new job with a new idempotency_key', old_job.id, old_job.status
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF (new_job.instance_id, new_job.payload, new_job.idempotency_key, new_job.priority,
        new_job.purpose, new_job.expires_at, new_job.max_attempts)
       IS DISTINCT FROM
       (old_job.instance_id, old_job.payload, old_job.idempotency_key, old_job.priority,
        old_job.purpose, old_job.expires_at, old_job.max_attempts) THEN
        RAISE EXCEPTION 'zapstream: job %: change its other columns in an UPDATE of their own, '
            'then set status = ''PENDING'' (the reprocess resends the job as it is then)',
            old_job.id
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    v_risk := zapstream_delivery_risk(old_job.id);
    IF v_risk IS NOT NULL THEN
        RAISE EXCEPTION 'zapstream: job % may already have been delivered (%): a reprocess may '
            'send it twice; if that is acceptable, run `zapstream jobs reprocess % --reason ... '
            '--by ... --yes`', old_job.id, v_risk, old_job.id
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    v_reason := coalesce(
        nullif(btrim(current_setting('zapstream.reason', true)), ''),
        'reprocess by SQL: UPDATE outbox_jobs SET status = ''PENDING'' (no zapstream.reason set)'
    );
    INSERT INTO outbox_commands (job_id, idempotency_key, command, reason, actor)
    VALUES (old_job.id, old_job.idempotency_key, 'reprocess', v_reason, current_user)
    RETURNING id INTO v_command_id;
    RAISE NOTICE 'zapstream: job % reprocess requested (command %, by %): it stays % until the '
        'worker takes it up; the answer is in outbox_job_events (command_id %)',
        old_job.id, v_command_id, current_user, old_job.status, v_command_id;
    -- The worker's answer moves the job; until then it is what it was.
    new_job.status := old_job.status;
    new_job.attempts := old_job.attempts;
    new_job.next_retry_at := old_job.next_retry_at;
    new_job.last_error := old_job.last_error;
    new_job.sent_at := old_job.sent_at;
    RETURN new_job;
END
$$;

CREATE OR REPLACE FUNCTION zapstream_outbox_status_write() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    -- streams/kernel/state_machine.py: SETTLED, and the states before a job settles.
    v_settled CONSTANT TEXT[] := ARRAY['ACCEPTED', 'DELIVERED', 'READ', 'FAILED', 'DEAD',
        'EXPIRED', 'CANCELLED', 'UNCERTAIN', 'REVIEW', 'INVALID',
        'OPTED_OUT'];
    v_unsettled CONSTANT TEXT[] := ARRAY['PENDING', 'ATTEMPTING', 'RETRY_WAIT'];
    v_status_changed BOOLEAN := NEW.status IS DISTINCT FROM OLD.status;
BEGIN
    IF NOT OLD.status = ANY (v_settled || v_unsettled) THEN
        RETURN NEW;  -- a state another migration added: its own rules apply
    END IF;
    IF v_status_changed AND NEW.status = 'PENDING' AND OLD.status = ANY (v_settled) THEN
        RETURN zapstream_reprocess_by_update(OLD, NEW);
    END IF;
    IF v_status_changed AND NOT NEW.status = ANY (v_settled || v_unsettled || ARRAY['SENT']) THEN
        RETURN NEW;  -- into a state another migration added: its own rules apply
    END IF;
    IF v_status_changed AND NEW.status = 'CANCELLED' THEN
        RAISE EXCEPTION 'zapstream: job % is cancelled by a command, not by writing its status: '
            'SELECT zapstream_cancel(idempotency_key, reason) or `zapstream jobs cancel %`',
            OLD.id, OLD.id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF v_status_changed AND NEW.status = 'PENDING' THEN
        RAISE EXCEPTION 'zapstream: job % is %: zapstream''s worker is sending it and retries '
            'it on its own; a reprocess is for DEAD, FAILED or UNCERTAIN jobs', OLD.id, OLD.status
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RAISE EXCEPTION 'zapstream: job % is sent by zapstream''s worker, which writes its status, '
        'attempts, last_error and sent_at: do not run a worker of your own (it would send '
        'twice); run `zapstream relay`, `zapstream worker` and `zapstream sink`', OLD.id
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'resend a DEAD job with `zapstream jobs reprocess <id>` or '
                     'UPDATE outbox_jobs SET status = ''PENDING'' WHERE id = <id>';
END
$$;

DROP TRIGGER IF EXISTS outbox_jobs_status_writes ON outbox_jobs;
CREATE TRIGGER outbox_jobs_status_writes
    BEFORE UPDATE OF status, attempts, last_error, sent_at ON outbox_jobs
    FOR EACH ROW
    WHEN (NEW.state_version IS NOT DISTINCT FROM OLD.state_version
          AND (NEW.status IS DISTINCT FROM OLD.status
               OR NEW.attempts IS DISTINCT FROM OLD.attempts
               OR NEW.last_error IS DISTINCT FROM OLD.last_error
               OR NEW.sent_at IS DISTINCT FROM OLD.sent_at))
    EXECUTE FUNCTION zapstream_outbox_status_write();
