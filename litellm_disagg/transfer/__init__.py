"""Transfer: the prefill call (``prefill``: the HTTP request to a prefill worker, with its error classes).

What the prefill request carries and what comes back are each engine's own (``litellm_disagg.engines``: a
``TransferProtocol`` per engine).
"""
