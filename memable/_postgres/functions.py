"""Server-side functions of the PostgreSQL store: one round trip for an operation of several
statements.

A network round trip costs as much as a primary-key read, so the store's
branching operations (deliver a signal, record a suspension, claim an
instance) run as PL/pgSQL functions, created with the tables. Each is one
statement, so one transaction: it locks the instance row first, decides and
writes, and its caller maps the answer to the engine's outcome or error.

Durability: every claim (a resume's, a wake-up's, a recovery's; a queue's,
``memable._store.sql.queues``) commits at the session's ``synchronous_commit``,
as every other write does: its run acts on it at once, and a step's side effect
must never rest on a claim a server crash can undo (the instance would be queued, or suspended and
ready, again, and run a second time beside the step still running). Only a
suspension that goes on at once (its key completed) commits with
``synchronous_commit`` off: it changes no owner or status, the instance stays
running and this engine's, and the run's next write commits durably and, the
WAL being one sequence, makes it durable too.
"""

from __future__ import annotations

import re

from .._store.rows import UNREACHED
from .._store.sql.instances import CLAIM_SET, COUNT_LOST, FIRE_KEY, FIRE_KEY_WHERE, WAKE
from .sql import OWNER_FREE


def _plpgsql(text: str, **names: str) -> str:
    """The shared SQL ``text`` (``:name`` parameters) with each parameter a PL/pgSQL name.

    >>> _plpgsql("queue = :queue AND at <= :now", queue="p_queue", now="v_now")
    'queue = p_queue AND at <= v_now'
    """
    return re.sub(r":([a-z_]+)\b", lambda m: names[m[1]], text)


#: What a claim writes (as on SQLite).
_CLAIM_SET = CLAIM_SET.replace(":me", "p_me").replace(":at", "p_at").replace(
    ":claim", "p_claim")

#: A recovery counts the execution lost in flight (as on SQLite).
_COUNT_LOST = _plpgsql(COUNT_LOST, workflow="p_workflow", instance_id="p_instance",
                       key="(instance->>'lost_step')", lost_by="(instance->>'lost_by')")

#: What firing a due timer row does to its key (as on SQLite).
_FIRE_KEY = FIRE_KEY.format(at="p_at")

#: Whether an instance's owner is gone (its lease ran out), by the server's clock.
_OWNER_FREE = OWNER_FREE.replace("%(me)s", "p_me")
#: The instance's steps as a JSON array of ``StoredStep`` fields (an empty one if none).
_STEPS = """(SELECT COALESCE(json_agg(json_build_array(
        key, seq, kind, state, result, result_type, status, attempts)), '[]'::json)
    FROM steps WHERE workflow = p_workflow AND instance_id = p_instance)"""

FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION memable_claim(
    p_workflow text, p_instance text, p_me text, p_at text, p_claim text,
    OUT instance json, OUT steps json)
LANGUAGE plpgsql AS $fn$
BEGIN
    -- A wake-up or a recovery skips a row another transaction holds (another
    -- engine's claim, or a lost owner's transaction the server has not ended
    -- yet): the poll finds it again. The user's resume waits its turn. Every
    -- claim commits at the session's durability: its run acts on it at once.
    IF p_claim <> 'resume' THEN
        PERFORM 1 FROM instances WHERE workflow = p_workflow AND instance_id = p_instance
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN RETURN; END IF;
    END IF;
    UPDATE instances SET {_CLAIM_SET}
    WHERE workflow = p_workflow AND instance_id = p_instance AND CASE p_claim
        WHEN 'wake' THEN {WAKE}
        WHEN 'resume' THEN status <> 'cancelled' AND (status <> 'running' OR {_OWNER_FREE})
        ELSE status = 'running' AND {_OWNER_FREE} END
    RETURNING row_to_json(instances.*) INTO instance;
    IF instance IS NULL THEN RETURN; END IF;
    IF instance->>'lost_owner' IS NOT NULL AND instance->>'lost_step' IS NOT NULL THEN
        {_COUNT_LOST};
    END IF;
    -- An instance of a queue waits for a slot: nothing to run yet.
    IF instance->>'status' = 'queued' THEN steps := '[]'::json; RETURN; END IF;
    -- A statement of its own, after the claim took the row: it sees every step
    -- the previous owner committed, and that owner can write no more.
    steps := {_STEPS};
END $fn$;

CREATE OR REPLACE FUNCTION memable_deliver_signal(
    p_workflow text, p_instance text, p_key text, p_result text, p_result_type text,
    p_at text, p_channel text, p_payload text)
RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    v_status text; v_kind text; v_state text; v_seq integer;
BEGIN
    SELECT status INTO v_status FROM instances
    WHERE workflow = p_workflow AND instance_id = p_instance FOR UPDATE;
    IF NOT FOUND THEN RETURN 'missing'; END IF;
    IF v_status IN ('completed', 'failed', 'cancelled') THEN
        RETURN 'finished ' || v_status;
    END IF;
    -- The key's deadline goes first: a firing that holds its row is waited for
    -- (and then seen below: the key timed out); one that comes later finds no row.
    DELETE FROM timers WHERE workflow = p_workflow AND instance_id = p_instance
    AND key = p_key;
    SELECT kind, state, seq INTO v_kind, v_state, v_seq FROM steps
    WHERE workflow = p_workflow AND instance_id = p_instance AND key = p_key;
    IF FOUND THEN
        IF v_kind <> 'signal' THEN RETURN 'kind ' || v_kind; END IF;
        IF v_state = 'completed' THEN RETURN 'holds'; END IF;
        IF v_state = 'timed_out' THEN RETURN 'timed out'; END IF;
    ELSE  -- not reached yet: after every step until the run reaches it (rows.UNREACHED)
        v_seq := {UNREACHED};
    END IF;
    INSERT INTO steps (workflow, instance_id, key, seq, kind, state, result, result_type,
                       attempts, completed_at)
    VALUES (p_workflow, p_instance, p_key, v_seq, 'signal', 'completed', p_result,
            p_result_type, 1, p_at)
    ON CONFLICT (workflow, instance_id, key) DO UPDATE SET state = 'completed',
        result = excluded.result, result_type = excluded.result_type, attempts = 1,
        completed_at = excluded.completed_at;
    PERFORM pg_notify(p_channel, p_payload);
    RETURN 'ok';
END $fn$;

CREATE OR REPLACE FUNCTION memable_suspend(
    p_workflow text, p_instance text, p_key text, p_seq integer, p_kind text,
    p_result text, p_status text, p_message text, p_at text, p_deadline double precision,
    p_now double precision, p_me text, p_channel text, p_payload text,
    OUT outcome text, OUT armed double precision, OUT instance json, OUT steps json)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_status text; v_owner text; v_kind text; v_state text; v_found boolean;
    v_ready boolean; v_had boolean; v_pending integer;
BEGIN
    SELECT status, owner INTO v_status, v_owner FROM instances
    WHERE workflow = p_workflow AND instance_id = p_instance FOR UPDATE;
    IF NOT FOUND OR v_owner IS DISTINCT FROM p_me THEN outcome := 'lost'; RETURN; END IF;
    -- Cancelled meanwhile: arm nothing, write nothing.
    IF v_status <> 'running' THEN outcome := 'stopped'; RETURN; END IF;
    IF p_kind = 'children' THEN
        -- A group of children: no row of its own; ready once none is pending.
        SELECT count(*) INTO v_pending FROM steps
        WHERE workflow = p_workflow AND instance_id = p_instance AND kind = 'child'
        AND state = 'waiting' AND substr(key, 1, length(p_key) + 1) = p_key || '[';
        v_ready := v_pending = 0;
    ELSE  -- a key of its own (this branch ends before "go on at once")
    SELECT kind, state INTO v_kind, v_state FROM steps
    WHERE workflow = p_workflow AND instance_id = p_instance AND key = p_key;
    v_found := FOUND;
    IF v_found AND v_kind <> p_kind THEN outcome := 'kind ' || v_kind; RETURN; END IF;
    v_ready := v_found AND (v_state IN ('completed', 'timed_out')
                            OR (v_kind = 'child' AND v_state = 'failed'));
    IF NOT v_ready AND p_deadline IS NOT NULL THEN
        -- The first arming sets the deadline; runs after it do not move it.
        SELECT deadline INTO armed FROM timers
        WHERE workflow = p_workflow AND instance_id = p_instance AND key = p_key;
        v_had := FOUND;
        IF NOT v_had THEN armed := p_deadline; END IF;
        IF armed <= p_now THEN  -- due already: fire it here
            IF v_had THEN
                DELETE FROM timers
                WHERE workflow = p_workflow AND instance_id = p_instance AND key = p_key;
                UPDATE steps SET {_FIRE_KEY}
                WHERE workflow = p_workflow AND instance_id = p_instance AND key = p_key
                AND {FIRE_KEY_WHERE};
            ELSIF p_kind <> 'step' THEN  -- never armed: store it fired (or timed out)
                INSERT INTO steps (workflow, instance_id, key, seq, kind, state, result,
                                   status, attempts, completed_at)
                VALUES (p_workflow, p_instance, p_key, p_seq, p_kind,
                        CASE p_kind WHEN 'timer' THEN 'completed' ELSE 'timed_out' END,
                        CASE p_kind WHEN 'timer' THEN 'null' END, p_status, 1,
                        CASE p_kind WHEN 'timer' THEN p_at END)
                ON CONFLICT (workflow, instance_id, key) DO UPDATE SET
                    state = excluded.state, result = excluded.result, result_type = NULL,
                    status = excluded.status, error = NULL, attempts = steps.attempts + 1,
                    completed_at = excluded.completed_at, started_at = NULL, traceback = NULL
                WHERE steps.state NOT IN ('completed', 'timed_out')
                AND steps.kind = excluded.kind;
            END IF;
            v_ready := true;
        ELSIF NOT v_had THEN
            INSERT INTO timers (workflow, instance_id, key, deadline)
            VALUES (p_workflow, p_instance, p_key, p_deadline);
            PERFORM pg_notify(p_channel, p_payload);
        END IF;
    END IF;
    -- The key is reached: a suspend point or timer waits, unless it goes on at once;
    -- a retry backoff's failed row turns waiting either way (the next attempt
    -- overwrites it). The timer statements above touch timer rows only.
    IF p_kind = 'step' OR NOT v_ready THEN
        INSERT INTO steps (workflow, instance_id, key, seq, kind, state, result, status,
                           attempts)
        VALUES (p_workflow, p_instance, p_key, p_seq, p_kind, 'waiting', p_result,
                p_status, 0)
        ON CONFLICT (workflow, instance_id, key) DO UPDATE SET
            state = 'waiting', result = excluded.result
        WHERE steps.state = 'failed' AND steps.kind = excluded.kind;
    END IF;
    END IF;
    IF v_ready THEN  -- go on at once: the instance stays running, and ours
        PERFORM set_config('synchronous_commit', 'off', true);
        outcome := 'ready';
        SELECT row_to_json(i.*) INTO instance FROM instances AS i
        WHERE workflow = p_workflow AND instance_id = p_instance;
        steps := {_STEPS};
        RETURN;
    END IF;
    UPDATE instances SET status = 'suspended', message = p_message, waiting_for = p_key,
        children_pending = v_pending, owner = NULL, updated_at = p_at
    WHERE workflow = p_workflow AND instance_id = p_instance AND owner = p_me
    AND status = 'running';
    outcome := 'waiting';
END $fn$;
"""
