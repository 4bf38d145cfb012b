"""The ner_decoder stage: CRF Viterbi, BIOES spans, entity JSON (numpy)."""
