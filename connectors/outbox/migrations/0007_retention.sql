-- zapstream retention: `zapstream outbox prune` keeps old settled jobs as audit stubs.
--
-- A pruned job keeps its row in outbox_jobs (id, idempotency key, instance, status,
-- attempts, timestamps, gateway job id, last error), so its idempotency key still
-- refuses a second enqueue and a late redelivery still finds it settled. Its message
-- is gone: the payload becomes {"type": ..., "pruned_at": ...} and the conversation
-- key (the recipient's digits) NULL, in the job and in its commands and replays. Of
-- its state changes only the last one stays (to_status, actor, reason, at).
--
-- A command on a pruned job would re-send an empty message: refuse it. This trigger
-- runs after outbox_commands_copy_job (triggers of one event fire in name order), so
-- NEW.payload is already the job's.

CREATE OR REPLACE FUNCTION zapstream_command_refuse_pruned() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.payload ? 'pruned_at' THEN
        RAISE EXCEPTION 'zapstream: job % was pruned at %: its message is no longer kept',
            NEW.job_id, NEW.payload ->> 'pruned_at'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'enqueue a new job with a new idempotency key';
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS outbox_commands_refuse_pruned ON outbox_commands;
CREATE TRIGGER outbox_commands_refuse_pruned BEFORE INSERT ON outbox_commands
    FOR EACH ROW EXECUTE FUNCTION zapstream_command_refuse_pruned();

