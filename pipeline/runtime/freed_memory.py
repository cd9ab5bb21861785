"""Giving the memory a finished batch freed back to the system, in our long-lived Python processes.

The driver holds each micro-batch as one Arrow table for the sinks, and a Python worker holds
a read task's messages and Arrow batches: hundreds of MB that are freed when the batch is done.
glibc's malloc keeps freed memory for reuse, so without this each process stays at the size of
the largest batch it ever held, and the job's RSS with it (bench/bench_state.py). Arrow's
pool is the system allocator in every process of the job (``ARROW_DEFAULT_MEMORY_POOL``, set
in pipeline/runtime/spark.py), and its ``release_unused`` is glibc's ``malloc_trim``: it hands back
the free pages of every malloc arena in the process, Python's and pulsar-client's too.
"""

from __future__ import annotations

# The pool every Python process of the job allocates Arrow memory from: the system allocator
# hands freed memory back (a read worker: about 360 -> 220 to 320 MB; bench/README.md, stop 23).
ARROW_POOL_VARIABLE, ARROW_POOL = "ARROW_DEFAULT_MEMORY_POOL", "system"
# glibc's malloc arenas in the JVM (and its Python workers): at most two. With one per thread,
# the JVM's memory outside the JVM's own tracking grew about 19 MB a minute once RocksDB's block
# cache was full and evicting (freed blocks kept by arenas no thread reuses); with two it stayed
# under 150 MB over 50 minutes, its batches as fast (bench/README.md, 2026-11-27).
MALLOC_ARENAS_VARIABLE, MALLOC_ARENAS = "MALLOC_ARENA_MAX", "2"
# The allocator the driver JVM is started with, where Debian's libjemalloc2 is installed (``make
# setup``): with glibc, even with two arenas, its memory outside the JVM's own tracking beyond
# RocksDB's cache still grew about 4.7 MB a minute once that cache was full (256 MB at minute 60);
# with jemalloc it stayed at 61 to 64 MB over the last 10 of 45 minutes (bench/README.md,
# 2026-11-27). The Python workers keep glibc: their memory is handed back with malloc_trim.
JEMALLOC = "libjemalloc.so.2"


def jvm_allocator() -> str | None:
    """The library to preload into the driver JVM (``LD_PRELOAD``), or None where there is none."""
    import ctypes.util

    return JEMALLOC if ctypes.util.find_library("jemalloc") == JEMALLOC else None


def give_back_freed_memory() -> None:
    """Return the free pages of this process's heap to the system (a few ms; once a batch)."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
