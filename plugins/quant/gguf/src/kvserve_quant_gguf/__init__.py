"""GGUF weights for kvserve: linear layers keep llama.cpp's GGML blocks as the file stores them."""
