"""Code the codegen stages share (preprocess, generator, collect, postprocess, stream front): one
sequence's generation parameters and their limits, the BLS client of the generator, the detokenizer."""
