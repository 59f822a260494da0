"""glassgpt.inspect"""
