"""kmesh: measure how LLM serving engines share KV cache."""
