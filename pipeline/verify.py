"""`python -m pipeline.verify` and `from pipeline import verify` keep working:
the tool lives in pipeline/readers/verify.py.

This name is the same module object as `pipeline.readers.verify`, so what is set on one is set on the other.
"""

import sys

if __name__ == "__main__":
    import runpy

    runpy.run_module("pipeline.readers.verify", run_name="__main__", alter_sys=True)
else:
    from pipeline.readers import verify

    sys.modules[__name__] = verify
