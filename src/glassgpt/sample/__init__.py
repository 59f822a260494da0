"""glassgpt.sample"""
