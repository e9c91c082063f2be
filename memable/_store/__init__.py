"""The store protocol: what a store offers the engine, and what passes between them.

Its one job: the operations every store implements, each with the guarantee
it gives atomically: what a run needs (``protocol.RunStore``), what an operator
reads and does (``operator.OperatorStore``), and both (``protocol.Store``); the
rows they pass (``rows``); how values are stored and rebuilt (``serde``); the
two control-flow exceptions a store write raises (``control``); how an owner's
liveness is judged (``liveness``); an operator's validated writes through any
store (``admin``); the transaction interface both stores implement
(``transaction``); and each operation's transaction body, written once against
it (``sql``), so neither store borrows from the other.

May import: the value modules (``memable._errors``, ``_records``, ``_states``,
``_validate``, ...). Never a driver, a store, the runner or the engine.
"""
