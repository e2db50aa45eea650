"""resstream.training"""
