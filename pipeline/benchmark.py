"""`python -m pipeline.benchmark` and `from pipeline import benchmark` keep working:
the tool lives in pipeline/readers/benchmark.py.

This name is the same module object as `pipeline.readers.benchmark`, so what is set on one is set on the other.
"""

import sys

if __name__ == "__main__":
    import runpy

    runpy.run_module("pipeline.readers.benchmark", run_name="__main__", alter_sys=True)
else:
    from pipeline.readers import benchmark

    sys.modules[__name__] = benchmark
