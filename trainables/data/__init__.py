"""Images in: data sets, decoding, the batched augmentation, Study L's protocols on tensors."""
