-- fencelock's fencing check for PostgreSQL, setup version 2.
--
-- Install it once per database (the objects go into the first schema of search_path):
--     fencelock sql | psql -v ON_ERROR_STOP=1 "$DATABASE_URL"
-- Running it again (an upgrade, or twice at once) is safe: it creates what is missing,
-- replaces the function, and keeps every token recorded.
--
-- Then, inside each transaction that writes to a resource guarded by a fencelock lock,
-- before the writes:
--     SELECT fencelock_check('orders:42', 9071);   -- the lock's name, its fencing token
-- The check records the token when it is at least the highest one the resource has
-- accepted, and otherwise raises SQLSTATE FL001 (stale fencing token), so that the
-- whole transaction rolls back. The resource's row stays locked until the transaction
-- ends: a writer with an older token that reaches it meanwhile waits, then fails once
-- the newer writer commits; writers with the same token (one holder's retries) both
-- pass. In REPEATABLE READ or SERIALIZABLE, a writer that waited on a newer one that
-- committed fails with SQLSTATE 40001 instead (retry: the retry sees the newer token).
-- From psql, end the check with \g /dev/null instead of ; to send its empty result
-- nowhere. The caller needs SELECT, INSERT and UPDATE on fencelock_fence, and USAGE on
-- the sequence fencelock_refusals for its refusals to be counted.
--
-- A refusal rolls its transaction back, so it leaves nothing in fencelock_fence; it is
-- counted in the sequence fencelock_refusals, which a rollback does not undo:
--     SELECT fencelock_refusals();   -- refusals since the setup was installed

BEGIN;
SET LOCAL client_min_messages = warning;
-- One install at a time: two CREATE TABLE IF NOT EXISTS at once can both try to create.
DO $lock$ BEGIN PERFORM pg_advisory_xact_lock(hashtext('fencelock setup')); END $lock$;

-- The highest fencing token each resource has accepted.
CREATE TABLE IF NOT EXISTS fencelock_fence (
    resource    text PRIMARY KEY,
    token       numeric NOT NULL,
    accepted_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE fencelock_fence IS
    'fencelock: the highest fencing token each resource accepted (fencelock_check, setup version 2)';

-- Every refusal of a stale token, counted outside the transaction it rolls back.
CREATE SEQUENCE IF NOT EXISTS fencelock_refusals;
COMMENT ON SEQUENCE fencelock_refusals IS
    'fencelock: refusals of stale fencing tokens by fencelock_check (setup version 2)';

CREATE OR REPLACE FUNCTION fencelock_refusals() RETURNS bigint
LANGUAGE sql STABLE AS $refusals$
    SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM fencelock_refusals;
$refusals$;
COMMENT ON FUNCTION fencelock_refusals() IS
    'fencelock: how many stale fencing tokens fencelock_check refused (setup version 2)';

CREATE OR REPLACE FUNCTION fencelock_check(resource text, token numeric) RETURNS void
LANGUAGE plpgsql VOLATILE AS $check$
-- The arguments are named as the table's columns: a bare name is the column.
#variable_conflict use_column
DECLARE
    wanted  numeric;
    highest numeric;
BEGIN
    IF fencelock_check.resource IS NULL OR fencelock_check.resource = '' THEN
        RAISE EXCEPTION 'fencelock_check: the resource name is empty'
            USING ERRCODE = '22023',
                  HINT = 'Name the resource after the lock that guards it.';
    END IF;
    IF fencelock_check.token IS NULL OR fencelock_check.token < 0
        OR fencelock_check.token <> trunc(fencelock_check.token)
        OR fencelock_check.token > 18446744073709551615 THEN
        RAISE EXCEPTION 'fencelock_check: % is not a fencing token',
                coalesce(fencelock_check.token::text, 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'A fencing token is a whole number from 0 to 18446744073709551615 (FENCELOCK_TOKEN).';
    END IF;
    wanted := trunc(fencelock_check.token);

    -- A resource's first token creates its row (a concurrent first insert is waited for).
    INSERT INTO fencelock_fence AS f (resource, token)
        VALUES (fencelock_check.resource, wanted)
        ON CONFLICT (resource) DO NOTHING;
    -- Locked until this transaction ends: every other check of the resource waits here,
    -- then reads the token the winner committed.
    SELECT f.token INTO highest
        FROM fencelock_fence AS f
        WHERE f.resource = fencelock_check.resource
        FOR UPDATE;
    IF highest > wanted THEN
        -- Counted before the exception rolls everything else back; a role without
        -- USAGE on the sequence is refused all the same, uncounted.
        BEGIN
            PERFORM nextval('fencelock_refusals');
        EXCEPTION WHEN insufficient_privilege OR undefined_table THEN
            NULL;
        END;
        RAISE EXCEPTION 'fencelock: stale fencing token % for resource %: token % was accepted already, so this holder lost its lock; the transaction is rolled back',
                wanted, quote_literal(fencelock_check.resource), highest
            USING ERRCODE = 'FL001',
                  DETAIL = format('token=%s highest=%s', wanted, highest),
                  HINT = 'Stop writing: take the lock again for a new token.';
    END IF;
    IF highest < wanted THEN
        UPDATE fencelock_fence AS f
            SET token = wanted, accepted_at = now()
            WHERE f.resource = fencelock_check.resource;
    END IF;
END;
$check$;
COMMENT ON FUNCTION fencelock_check(text, numeric) IS
    'fencelock: accept a fencing token for a resource or raise FL001 (setup version 2)';

COMMIT;
