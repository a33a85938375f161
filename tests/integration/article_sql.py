"""The outbox article's SQL ("Outbox pattern no WhatsApp"), statement by statement, verbatim.

docs/guides/application.md ("The outbox article's statements") says what each does with
zapstream; every one has a test (tests/integration/test_commands.py, the section "the outbox
article's statements", and tests/integration/test_commands_e2e.py for the reprocess end to
end). Only the placeholders change: the article's ``$1`` (node-postgres) and ``?`` become
psycopg's ``%s``, and its failure UPDATE's interpolated ``${proximaTentativa}`` is the first
backoff step it builds (``NOW() + INTERVAL '60 seconds'``).
"""

from __future__ import annotations

CREATE_TABLE = """
CREATE TABLE outbox_jobs (
  id              BIGSERIAL PRIMARY KEY,
  instance_id     VARCHAR(64) NOT NULL,
  payload         JSONB NOT NULL,
  status          VARCHAR(20) NOT NULL DEFAULT 'PENDING',
  attempts        INT NOT NULL DEFAULT 0,
  max_attempts    INT NOT NULL DEFAULT 5,
  next_retry_at   TIMESTAMP NOT NULL DEFAULT NOW(),
  last_error      TEXT,
  idempotency_key VARCHAR(128) UNIQUE,
  created_at      TIMESTAMP NOT NULL DEFAULT NOW(),
  sent_at         TIMESTAMP NULL
);
"""

CREATE_INDEXES = """
CREATE INDEX idx_outbox_pending ON outbox_jobs(next_retry_at)
  WHERE status = 'PENDING';

CREATE INDEX idx_outbox_dead ON outbox_jobs(status)
  WHERE status = 'DEAD';
"""

INSERT = """
      INSERT INTO outbox_jobs (instance_id, payload, idempotency_key)
      VALUES (%s, %s, %s)
    """
"""The application's enqueue, in its own transaction; payload ``{type, to, text}``."""

CLAIM = """
    SELECT id, instance_id, payload, attempts, max_attempts
    FROM outbox_jobs
    WHERE status = 'PENDING'
      AND next_retry_at <= NOW()
    ORDER BY next_retry_at
    LIMIT 50
    FOR UPDATE SKIP LOCKED
  """
"""The article's worker: claim a batch."""

MARK_SENT = "UPDATE outbox_jobs SET status = 'SENT', sent_at = NOW() WHERE id = %s"
"""The article's worker, after the gateway accepted."""

MARK_FAILED = """
        UPDATE outbox_jobs SET
          status = %s,
          attempts = %s,
          next_retry_at = NOW() + INTERVAL '60 seconds',
          last_error = %s
        WHERE id = %s
      """
"""The article's worker, after the gateway failed: ``(PENDING | DEAD, attempts, error, id)``."""

STUCK = (
    "SELECT count(*) FROM outbox_jobs WHERE status = 'PENDING' "
    "AND created_at < NOW() - INTERVAL '10 minutes'"
)
"""The FAQ's monitoring query ("Como monitorar jobs travados?"); alert above 100."""

DEAD_ALERT = "SELECT count(*) FROM outbox_jobs WHERE status = 'DEAD'"
"""The FAQ's other alert: any DEAD job needs a person."""

IDEMPOTENCY = "SELECT status FROM outbox_jobs WHERE idempotency_key = %s"
"""The FAQ's idempotent worker: "before processing, SELECT; if it is SENT already, skip"."""

REPROCESS = (
    "UPDATE outbox_jobs SET status = 'PENDING', attempts = 0, next_retry_at = NOW() WHERE id = %s"
)
"""The FAQ's "Como reprocessar mensagem em status DEAD?"."""
