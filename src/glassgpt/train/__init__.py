"""glassgpt.train"""
