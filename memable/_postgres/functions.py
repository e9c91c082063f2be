"""Server-side functions of the PostgreSQL store: one round trip for an operation of several
statements.

A network round trip costs as much as a primary-key read, so the store's
claim of an instance runs as a PL/pgSQL function, created with the tables.
It is one statement, so one transaction: it locks the instance row first, decides and
writes, and its caller maps the answer to the engine's outcome or error.

Durability: every claim (a resume's, a wake-up's, a recovery's; a queue's,
``memable._store.sql.queues``) commits at the session's ``synchronous_commit``,
as every other write does: its run acts on it at once, and a step's side effect
must never rest on a claim a server crash can undo (the instance would be queued, or suspended and
ready, again, and run a second time beside the step still running). Only a
suspension that goes on at once (``memable._store.sql.suspensions``) commits
with ``synchronous_commit`` off (``Dialect.relaxed_commit``).
"""

from __future__ import annotations

import re

from .._store.sql.instances import CLAIM_SET, COUNT_LOST, WAKE
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
"""
