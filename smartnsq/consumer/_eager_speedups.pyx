# cython: language_level=3
"""The compiled twin of ``eager.run_eager`` (built where a C compiler is; see setup.py).

The same steps as the Python function, which stays the reference (``eager.pure_run_eager``;
``SMARTNSQ_PURE=1`` runs it): only the first send into the coroutine is done in C, entering
its context with ``PyContext_Enter`` and sending with ``PyIter_Send``, which gives a returned
value without raising ``StopIteration``. ``install`` hands it the module's own objects.
"""

from cpython.ref cimport PyObject, Py_XDECREF

cdef extern from "Python.h":
    int PyIter_Send(object iterator, object arg, PyObject **presult) except? -1
    object PyContext_CopyCurrent()
    int PyContext_Enter(object context) except -1
    int PyContext_Exit(object context) except -1

import asyncio

cdef object _EagerTask = None
cdef object _enter_task = None
cdef object _leave_task = None
cdef object _current_task = None
cdef object _new = object.__new__
cdef object _CancelledError = asyncio.CancelledError
cdef object _RUNNING = 0
cdef object _FINISHED = 1


def install(eager_task, enter_task, leave_task, current_task):
    """The objects of ``smartnsq.consumer.eager`` that ``run_eager`` works with."""
    global _EagerTask, _enter_task, _leave_task, _current_task
    _EagerTask = eager_task
    _enter_task = enter_task
    _leave_task = leave_task
    _current_task = current_task


cdef object _send(object context, object coro, int* status):
    """``coro.send(None)`` inside ``context``: the value yielded (status 1) or returned
    (status 0); what the coroutine raised is raised."""
    cdef PyObject* presult = NULL
    PyContext_Enter(context)
    try:
        status[0] = PyIter_Send(coro, None, &presult)
    finally:
        PyContext_Exit(context)
    value = <object>presult
    Py_XDECREF(presult)
    return value


def run_eager(loop, coro, done, arg=None):
    """``eager.run_eager``: start ``coro`` now, as an ``EagerTask``."""
    cdef int status = 0
    cdef bint over = False
    context = PyContext_CopyCurrent()
    task = _new(_EagerTask)
    task._loop = loop
    task._coro = coro
    task._context = context
    task._carrier = None
    task._state = _RUNNING
    task._extras = None
    outer = None
    try:
        _enter_task(loop, task)
    except RuntimeError:  # a Task is running this (an ordered turn passed on from one)
        outer = _current_task(loop)
        _leave_task(loop, outer)
        _enter_task(loop, task)
    error = None
    yielded = None
    try:
        value = _send(context, coro, &status)
        if status == 0:
            task._result = value
            over = True
        else:
            yielded = value
            while yielded is None and task._extras is not None and task._extras.cancel_due:
                # cancel() from the coroutine itself, then a bare yield: a Task throws the
                # cancellation in at its next step.
                task._extras.cancel_due = False
                error = _CancelledError(task._extras.cancel_message)
                yielded = context.run(coro.throw, error)
                error = None
    except StopIteration as stop:
        task._result = stop.value
        over = True
    except BaseException as exc:
        error = exc
        over = True
    finally:
        _leave_task(loop, task)
        if outer is not None:
            _enter_task(loop, outer)
    if not over:
        task._carry_on(yielded, done, arg)
        return task
    if error is None and task._extras is None:
        task._state = _FINISHED
        done(arg, None)
        return task
    task._over(error)
    done(arg, error)
    if error is not None and not isinstance(error, (Exception, _CancelledError)):
        raise error  # SystemExit, KeyboardInterrupt: they stop the program, not the message
    return task
