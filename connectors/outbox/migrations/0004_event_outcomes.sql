-- zapstream: structured command outcomes on job events.
--
-- The worker answers each cancel and reprocess command with one state record
-- carrying the command's id and an outcome (streams.kernel.contract.CommandOutcome:
-- cancelled, cancel_refused, cancel_unsupported, cancel_failed, reprocessed,
-- reprocess_refused). The state sink writes both here, so operators' tools
-- find the answer to their command by (command_id, outcome) instead of by the
-- reason's text. Rows written before this migration, and events that answer
-- no command, have NULL in both.
--
-- A job the relay rejected (zapstream.invalid) gets status INVALID, written by
-- the state sink with the reason in last_error; outbox_jobs.status is free
-- text, so that needs no change here.

ALTER TABLE outbox_job_events ADD COLUMN IF NOT EXISTS outcome TEXT;
ALTER TABLE outbox_job_events ADD COLUMN IF NOT EXISTS command_id BIGINT;

CREATE INDEX IF NOT EXISTS outbox_job_events_command_idx
    ON outbox_job_events (command_id) WHERE command_id IS NOT NULL;
