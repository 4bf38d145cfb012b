"""The codegen_collect stage: unary BLS front of the decoupled generator."""
