"""The workload record (docs/workload.md): graphs, traces, data and devices; query, slice, bind and IREE replay.

``model`` (pure data model), ``devices`` (SLURM import), ``chrome`` (trace export) have no I/O;
``store`` is the plyvel + safetensors adapter; graph export and IREE replay are adapters too.
"""
