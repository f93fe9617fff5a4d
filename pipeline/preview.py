"""`python -m pipeline.preview` and `from pipeline import preview` keep working:
the tool lives in pipeline/readers/preview.py.

This name is the same module object as `pipeline.readers.preview`, so what is set on one is set on the other.
"""

import sys

if __name__ == "__main__":
    import runpy

    runpy.run_module("pipeline.readers.preview", run_name="__main__", alter_sys=True)
else:
    from pipeline.readers import preview

    sys.modules[__name__] = preview
