"""The codegen_postprocess stage: detokenize, cut at stop words."""
