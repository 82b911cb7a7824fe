"""The loader library, in wings by job; each wing imports only the wings below it:

``io`` <- ``binder`` <- ``layout`` <- ``quant`` <- ``bind`` <- ``bound`` <- ``ranks``

Generated code imports runtime through ``runtime.binder`` alone; no module lives outside a
wing (``tests/tools/test_architecture.py`` checks both, and the arrows).
"""
