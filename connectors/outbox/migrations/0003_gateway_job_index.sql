-- Receipts without our reference are looked up by the gateway's job id.
CREATE INDEX IF NOT EXISTS outbox_jobs_gateway_job_idx ON outbox_jobs (gateway_job_id);
