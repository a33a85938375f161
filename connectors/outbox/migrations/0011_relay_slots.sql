-- zapstream relay slots: what the relay knows about its replication slot, kept in the
-- database itself so that it replicates to a standby and survives a promotion.
--
-- A row committed while no slot exists is never decoded. When zapstream creates the
-- slot (the relay finding it missing, or `db migrate`), it writes a new identity here
-- and the reason a restream is owed (restream_reason); while a relay streams the slot
-- it copies the slot's confirmed_flush_lsn into confirmed_lsn every few seconds. On
-- start and on every reconnect the relay compares (connectors/cdc/slot_gap.py): a
-- restream owed, a slot of another identity than the one it streamed, or a slot whose
-- confirmed_flush_lsn is behind confirmed_lsn is a gap, and the relay restreams every
-- PENDING job that exists at that moment (zapstream_restream_pending, below) through
-- outbox_replays. The worker drops a replay of a job it already handled.

CREATE TABLE IF NOT EXISTS outbox_relay_slots (
    slot_name       TEXT        PRIMARY KEY,
    slot_id         UUID        NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_lsn     PG_LSN      NOT NULL,
    confirmed_lsn   PG_LSN      NOT NULL,
    confirmed_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    restream_reason TEXT
);

-- zapstream created the slot (at p_lsn, its consistent point): a new identity, and a
-- restream owed for every PENDING job committed before it (written before the relay
-- streams it, so a crash in between still leaves the restream owed; p_reason NULL when
-- no job was PENDING once the slot existed: nothing can be missing).
CREATE OR REPLACE FUNCTION zapstream_relay_slot_created(p_slot TEXT, p_lsn PG_LSN, p_reason TEXT)
RETURNS UUID
LANGUAGE sql SECURITY DEFINER AS $$
    INSERT INTO outbox_relay_slots AS s
        (slot_name, slot_id, created_lsn, confirmed_lsn, restream_reason)
    VALUES (p_slot, gen_random_uuid(), p_lsn, p_lsn, p_reason)
    ON CONFLICT (slot_name) DO UPDATE SET
        slot_id = EXCLUDED.slot_id, created_at = now(), created_lsn = EXCLUDED.created_lsn,
        confirmed_lsn = EXCLUDED.confirmed_lsn, confirmed_at = now(),
        restream_reason = EXCLUDED.restream_reason
    RETURNING slot_id
$$;

-- The relay settled a gap (or adopts a slot it has no row for): the slot's position now,
-- no restream owed. Keeps the identity unless there is none yet.
CREATE OR REPLACE FUNCTION zapstream_relay_slot_settled(p_slot TEXT, p_lsn PG_LSN)
RETURNS UUID
LANGUAGE sql SECURITY DEFINER AS $$
    INSERT INTO outbox_relay_slots AS s (slot_name, slot_id, created_lsn, confirmed_lsn)
    VALUES (p_slot, gen_random_uuid(), p_lsn, p_lsn)
    ON CONFLICT (slot_name) DO UPDATE SET
        confirmed_lsn = EXCLUDED.confirmed_lsn, confirmed_at = now(), restream_reason = NULL
    RETURNING slot_id
$$;

-- While a relay streams the slot: the slot's own confirmed_flush_lsn (what PostgreSQL
-- holds as confirmed, never more than the relay reported), never moving back.
CREATE OR REPLACE FUNCTION zapstream_relay_slot_checkpoint(p_slot TEXT)
RETURNS PG_LSN
LANGUAGE sql SECURITY DEFINER AS $$
    UPDATE outbox_relay_slots s SET
        confirmed_lsn = greatest(s.confirmed_lsn, r.confirmed_flush_lsn), confirmed_at = now()
    FROM pg_replication_slots r
    WHERE s.slot_name = p_slot AND r.slot_name = p_slot AND r.confirmed_flush_lsn IS NOT NULL
      AND s.restream_reason IS NULL
    RETURNING s.confirmed_lsn
$$;

-- Copy every PENDING job created before p_before (NULL: every PENDING job) into
-- outbox_replays, in job id order (`zapstream outbox restream` and the relay's gap
-- recovery). The SHARE lock waits for the transactions inserting jobs now and holds new
-- ones until this one commits: every job committed before the replays is among them, so
-- the relay may drop the slot's own copy of such a job (connectors/cdc/slot_gap.py) and
-- a conversation keeps its order. FOR UPDATE: a job the sink writes is waited for.
CREATE OR REPLACE FUNCTION zapstream_restream_pending(
    p_before TIMESTAMPTZ, p_reason TEXT, p_actor TEXT, p_limit INTEGER DEFAULT NULL
) RETURNS TABLE (replayed BIGINT, first_job_id BIGINT, last_job_id BIGINT)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    ids BIGINT[];
BEGIN
    LOCK TABLE outbox_jobs IN SHARE MODE;
    SELECT coalesce(array_agg(x.id ORDER BY x.id), '{}') INTO ids FROM (
        SELECT j.id FROM outbox_jobs j
        WHERE j.status = 'PENDING' AND (p_before IS NULL OR j.created_at < p_before)
        ORDER BY j.id LIMIT p_limit
        FOR UPDATE
    ) x;
    INSERT INTO outbox_replays (job_id, reason, actor, instance_id, idempotency_key,
        conversation_key, payload, priority, purpose, expires_at, max_attempts, job_created_at)
    SELECT j.id, p_reason, p_actor, j.instance_id, j.idempotency_key, j.conversation_key,
        j.payload, j.priority, j.purpose, j.expires_at, j.max_attempts, j.created_at
    FROM outbox_jobs j WHERE j.id = ANY(ids) ORDER BY j.id;
    RETURN QUERY SELECT cardinality(ids)::BIGINT, ids[1], ids[cardinality(ids)];
END
$$;

-- SECURITY DEFINER functions resolve names in the outbox's schema only.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION zapstream_relay_slot_created(TEXT, PG_LSN, TEXT) '
                   'SET search_path = %I, pg_catalog, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION zapstream_relay_slot_settled(TEXT, PG_LSN) '
                   'SET search_path = %I, pg_catalog, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION zapstream_relay_slot_checkpoint(TEXT) '
                   'SET search_path = %I, pg_catalog, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION zapstream_restream_pending(TIMESTAMPTZ, TEXT, TEXT, INTEGER) '
                   'SET search_path = %I, pg_catalog, pg_temp', current_schema());
END
$$;
REVOKE ALL ON FUNCTION zapstream_relay_slot_created(TEXT, PG_LSN, TEXT) FROM PUBLIC;
REVOKE ALL ON FUNCTION zapstream_relay_slot_settled(TEXT, PG_LSN) FROM PUBLIC;
REVOKE ALL ON FUNCTION zapstream_relay_slot_checkpoint(TEXT) FROM PUBLIC;
REVOKE ALL ON FUNCTION zapstream_restream_pending(TIMESTAMPTZ, TEXT, TEXT, INTEGER) FROM PUBLIC;
