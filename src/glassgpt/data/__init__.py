"""glassgpt.data"""
