"""resstream.capture"""
