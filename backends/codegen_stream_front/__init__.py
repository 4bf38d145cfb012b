"""The codegen_stream_front stage: streaming BLS front: UTF-8-safe pieces, cancellation."""
