"""torch_memory_saver's module over npu-alloc, for code written against it:
``npu_alloc.alias_torch_memory_saver()`` (or ``sys.modules["torch_memory_saver"] = this``)
before that code imports ``torch_memory_saver``. The singleton and ``TorchMemorySaver``
instances behave as upstream's where npu-alloc can (docs/memory-saver.md);
``configure_subprocess`` has nothing to configure: call ``npu_alloc.install()`` in each process.
"""

from . import TorchMemorySaver, memory_saver as torch_memory_saver

configure_subprocess = torch_memory_saver.configure_subprocess

__all__ = ["TorchMemorySaver", "torch_memory_saver", "configure_subprocess"]
