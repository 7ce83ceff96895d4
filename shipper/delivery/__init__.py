"""Delivery to one sink: the worker loop, batch assembly, the committed progress, the
sink's state machine and the backoff between tries. The engine runs one worker per sink."""
