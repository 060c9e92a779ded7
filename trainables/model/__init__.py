"""The ViT, its positional encodings, and K same-shaped ViTs trained as one."""
