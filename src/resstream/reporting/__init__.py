"""resstream.reporting"""
