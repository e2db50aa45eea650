"""resstream.analysis"""
