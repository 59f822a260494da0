"""glassgpt.scaling"""
