-- zapstream opt-outs: recipients who said stop, per WhatsApp instance.
--
-- An opt-out is a row INSERTed into outbox_optouts, insert-only like
-- outbox_controls (never UPDATE or DELETE one: the table is the history of who
-- stopped and started again, when, and why). An opt-in (the person asked to hear
-- from the business again) is a row too, with action 'in'. The relay streams each
-- row to zapstream.controls as an OptOutChanged keyed per instance and person; every
-- worker keeps the opted-out people of every instance, and a bulk job to one of them
-- ends OPTED_OUT, never sent (an operational job is sent unless the application
-- marked it respect_opt_out).
--
--   INSERT INTO outbox_optouts (instance_id, recipient, reason)
--       VALUES ('shop-1', '+55 11 98765-4321', 'replied STOP');
--   INSERT INTO outbox_optouts (instance_id, recipient, action, reason)
--       VALUES ('shop-1', '5511987654321', 'in', 'replied START');
--   SELECT zapstream_opt_out('shop-1', '+55 11 98765-4321', 'replied STOP');
--   SELECT zapstream_opt_in('shop-1', '5511987654321', 'replied START');
--   SELECT * FROM zapstream_optouts;            -- who is opted out now, per instance
--   SELECT zapstream_opted_out('shop-1', '5511987654321');
--
-- The recipient is normalised on insert to the person it names, like a job's
-- conversation key (zapstream_conversation_key): '+55 11 98765-4321',
-- '5511987654321' and '5511987654321@s.whatsapp.net' are the same person; a group
-- keeps its JID. Anything else is refused with a check_violation.
--
-- Meta's error 131050 (the user stopped marketing messages from the business)
-- records an opt-out by itself: the worker ends the job OPTED_OUT as the actor
-- 'gateway:meta', the state sink writes that event, and the trigger below inserts
-- the opt-out (source 'meta', the job's recipient and id). The trigger function
-- runs as the tables' owner, so the sink needs no right on outbox_optouts (nor on
-- the job's payload); it fires for no other event.

CREATE TABLE IF NOT EXISTS outbox_optouts (
    id          BIGSERIAL PRIMARY KEY,
    instance_id TEXT        NOT NULL CHECK (btrim(instance_id) <> ''),
    recipient   TEXT        NOT NULL,
    action      TEXT        NOT NULL DEFAULT 'out' CHECK (action IN ('out', 'in')),
    source      TEXT        NOT NULL DEFAULT 'app' CHECK (source IN ('app', 'meta', 'operator')),
    reason      TEXT        NOT NULL DEFAULT 'opted out' CHECK (btrim(reason) <> ''),
    job_id      BIGINT,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS outbox_optouts_person_idx
    ON outbox_optouts (instance_id, recipient, id DESC);

-- The person a recipient names (digits, or a group's JID), or NULL when it is no
-- recipient zapstream sends to (streams.kernel.contract.CANONICAL_RECIPIENT).
CREATE OR REPLACE FUNCTION zapstream_optout_person(p_recipient TEXT) RETURNS TEXT
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN person ~ '^[1-9][0-9]{7,14}$' OR person ~ '^[0-9]{5,30}(-[0-9]{1,20})?@g\.us$'
            THEN person
    END
    FROM (SELECT zapstream_conversation_key(p_recipient) AS person) AS p
$$;

CREATE OR REPLACE FUNCTION zapstream_optout_normalise() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    person TEXT := zapstream_optout_person(NEW.recipient);
BEGIN
    IF person IS NULL THEN
        -- The value is not quoted: it may be most of a phone number.
        RAISE EXCEPTION 'zapstream: outbox_optouts.recipient is not a phone number with its '
            'country code (8 to 15 digits) nor a WhatsApp JID'
            USING ERRCODE = 'check_violation';
    END IF;
    NEW.recipient := person;
    NEW.instance_id := btrim(NEW.instance_id);
    NEW.reason := btrim(NEW.reason);
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS outbox_optouts_normalise ON outbox_optouts;
CREATE TRIGGER outbox_optouts_normalise BEFORE INSERT ON outbox_optouts
    FOR EACH ROW EXECUTE FUNCTION zapstream_optout_normalise();

-- Who is opted out now: the latest row per (instance, person), when it is 'out'.
CREATE OR REPLACE VIEW zapstream_optouts AS
    SELECT instance_id, recipient, source, reason, job_id, created_at AS at, optout_id
    FROM (
        SELECT DISTINCT ON (instance_id, recipient)
               instance_id, recipient, action, source, reason, job_id, created_at,
               id AS optout_id
        FROM outbox_optouts
        ORDER BY instance_id, recipient, id DESC
    ) AS latest
    WHERE action = 'out';

CREATE OR REPLACE FUNCTION zapstream_opt_out(
    p_instance TEXT, p_recipient TEXT, p_reason TEXT DEFAULT 'opted out',
    p_source TEXT DEFAULT 'app'
) RETURNS BIGINT
LANGUAGE sql AS $$
    INSERT INTO outbox_optouts (instance_id, recipient, action, source, reason)
    VALUES (p_instance, p_recipient, 'out', coalesce(p_source, 'app'),
            coalesce(p_reason, 'opted out'))
    RETURNING id
$$;

CREATE OR REPLACE FUNCTION zapstream_opt_in(
    p_instance TEXT, p_recipient TEXT, p_reason TEXT DEFAULT 'opted in',
    p_source TEXT DEFAULT 'app'
) RETURNS BIGINT
LANGUAGE sql AS $$
    INSERT INTO outbox_optouts (instance_id, recipient, action, source, reason)
    VALUES (p_instance, p_recipient, 'in', coalesce(p_source, 'app'),
            coalesce(p_reason, 'opted in'))
    RETURNING id
$$;

CREATE OR REPLACE FUNCTION zapstream_opted_out(p_instance TEXT, p_recipient TEXT)
RETURNS BOOLEAN
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT o.action = 'out' FROM outbox_optouts o
         WHERE o.instance_id = btrim(p_instance)
           AND o.recipient = zapstream_optout_person(p_recipient)
         ORDER BY o.id DESC LIMIT 1),
        false)
$$;

-- Meta's 131050, learnt by the worker: its OPTED_OUT event by 'gateway:meta'
-- becomes an opt-out of the job's recipient (unless the person is opted out already).
CREATE OR REPLACE FUNCTION zapstream_optout_from_gateway() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO outbox_optouts (instance_id, recipient, action, source, reason, job_id)
    SELECT j.instance_id, zapstream_optout_person(j.payload ->> 'to'), 'out', 'meta',
           left(coalesce(nullif(btrim(NEW.reason), ''), 'the gateway said the recipient opted out'),
                1000),
           j.id
    FROM outbox_jobs j
    WHERE j.id = NEW.job_id
      AND zapstream_optout_person(j.payload ->> 'to') IS NOT NULL
      AND NOT zapstream_opted_out(j.instance_id, j.payload ->> 'to');
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS outbox_job_events_optout ON outbox_job_events;
CREATE TRIGGER outbox_job_events_optout AFTER INSERT ON outbox_job_events
    FOR EACH ROW
    WHEN (NEW.to_status = 'OPTED_OUT' AND NEW.actor = 'gateway:meta')
    EXECUTE FUNCTION zapstream_optout_from_gateway();

-- Add the table to an existing zapstream publication (the relay or `db migrate`
-- does it too, for publications created later).
DO $$
DECLARE
    pub record;
BEGIN
    FOR pub IN
        SELECT p.pubname FROM pg_publication p
        JOIN pg_publication_tables t ON t.pubname = p.pubname
        WHERE t.tablename = 'outbox_jobs' AND t.schemaname = current_schema()
    LOOP
        EXECUTE format('ALTER PUBLICATION %I ADD TABLE outbox_optouts', pub.pubname);
    END LOOP;
END
$$;
