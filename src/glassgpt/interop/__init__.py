"""glassgpt.interop"""
