"""SQL for every index table, as small functions over a connection.

The host composes them inside one ``Database.tx()`` when a rule needs several
rows to change together (an approval, a turn end with its notification). Each
function maps rows to the records of ``core.records``; no SQL lives elsewhere.
The functions live in modules by table family and are used as ``repo.<name>``.
"""

from pidesk.store.repo.activity import *  # noqa: F403
from pidesk.store.repo.contracts import *  # noqa: F403
from pidesk.store.repo.recovery import *  # noqa: F403
from pidesk.store.repo.sessions import *  # noqa: F403
from pidesk.store.repo.changes import *  # noqa: F403
