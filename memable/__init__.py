"""memable: durable execution for plain synchronous Python functions.

Steps are memoised by explicit keys into SQLite, so a workflow that crashed,
failed or was suspended runs again without repeating a completed step.

>>> import memable
>>> from memable import Engine
>>> engine = Engine.in_memory()
>>> engine.register("hello", lambda ctx: ctx.step("greet:v1").run(lambda: "hello"))
>>> with engine:
...     engine.invoke("hello").result()
'hello'
"""

from importlib.metadata import PackageNotFoundError, version

from ._engine.builder import EngineBuilder
from ._engine.engine import Engine
from ._errors import (
    AlreadyStarted,
    ChildFailed,
    DuplicateStepKey,
    EngineError,
    InstanceFinished,
    InstanceNotFound,
    InvalidKey,
    NotStarted,
    SerializationError,
    SignalRejected,
    SignalTimeout,
    StepTimeout,
    StorageError,
    WorkflowFailed,
    WorkflowNotFound,
)
from ._records import MetadataStatus, StepRecord, WorkflowMetadata
from ._retry import Retry
from ._run.context import Context
from ._run.invocation import Invocation
from ._states import (
    Cancelled,
    Completed,
    Failed,
    InProgress,
    Queued,
    Started,
    Suspended,
    WorkflowState,
)
from ._step_error import StepError

try:
    __version__ = version("memable-engine")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = ["AlreadyStarted", "Cancelled", "ChildFailed", "Completed", "Context",
    "DuplicateStepKey", "Engine", "EngineBuilder", "EngineError", "Failed", "InProgress",
    "InstanceFinished", "InstanceNotFound", "InvalidKey", "Invocation", "MetadataStatus",
    "NotStarted", "Queued", "Retry", "SerializationError", "SignalRejected", "SignalTimeout",
    "Started", "StepError", "StepRecord", "StepTimeout", "StorageError", "Suspended",
    "WorkflowFailed", "WorkflowMetadata", "WorkflowNotFound", "WorkflowState"]
