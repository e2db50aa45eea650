"""resstream.adapters"""
