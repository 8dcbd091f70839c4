"""The core: the ALMA engine (evaluate, decide, train, publish for every chunk), its typed records,
the buffers where chunks wait, the factory that assembles an engine for either front door, and the
checkpoints it writes. Nothing here knows about Redis, Kafka or servers: the service and the research
tools plug their buffers and observers in.
"""
