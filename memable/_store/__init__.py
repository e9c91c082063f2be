"""The store protocol: what a store offers the engine, and what passes between them.

Its one job: the operations every store implements and the guarantee of each (``protocol``,
``operator``), what they pass (``rows``, ``serde``), and each operation's transaction body,
written once (``transaction``, ``sql``) so neither store borrows from the other.

May import: the value modules (``memable._errors``, ``_records``, ``_states``,
``_validate``, ...). Never a driver, a store, the runner or the engine."""
