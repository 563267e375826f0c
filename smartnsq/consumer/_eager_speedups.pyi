import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

def install(
    eager_task: type[Any],
    enter_task: Callable[[asyncio.AbstractEventLoop, Any], None],
    leave_task: Callable[[asyncio.AbstractEventLoop, Any], None],
    current_task: Callable[..., Any],
) -> None: ...
def run_eager(
    loop: asyncio.AbstractEventLoop,
    coro: Coroutine[Any, Any, Any],
    done: Callable[[Any, BaseException | None], None],
    arg: Any = ...,
) -> Any: ...
