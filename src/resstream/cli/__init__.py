"""resstream.cli"""
