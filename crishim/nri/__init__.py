"""The NRI front's transport: containerd's Node Resource Interface spoken by a Python plugin.

``mux`` (NRI's connection multiplexer), ``ttrpc`` (the RPC framing on each logical connection),
``plugin`` (a plugin's session: register, Configure, Synchronize, container events) and the
messages generated from proto/nri by ``make proto``. docs/nri.md describes the protocol and the
NRI version supported.
"""
