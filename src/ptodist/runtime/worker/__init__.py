"""DistributedWorker: ranks started once on any backend and dispatched many times.

Modules, by responsibility: ``api`` (DistributedWorker, the public surface), ``handles`` (RunHandle,
DeviceTensor, StackedDeviceTensor), ``memory`` (shared files, ``shared_array``), ``binding``
(arguments → memory the ranks see, commands), ``plans`` (planning with sub-worker calls),
``intake`` (accepting a dispatch: checks, binding, planning), ``engine`` (the queue and its driving on
the rank group), ``arenas`` (the dispatches' window heaps), ``callbacks`` (how sub-worker callbacks are
called: ``MappedArgs``), ``base`` (``Worker``, the base class ChipWorker shares).
"""

from .api import DistributedWorker
from .base import Worker
from .callbacks import MappedArgs
from .handles import DeviceTensor, DistributedRunHandle, RegistrationHandle, RunHandle, StackedDeviceTensor
from .memory import shared_array

__all__ = ["DeviceTensor", "DistributedRunHandle", "DistributedWorker", "MappedArgs", "RegistrationHandle",
           "RunHandle", "StackedDeviceTensor", "Worker", "shared_array"]
