"""glassgpt.tokenizer"""
