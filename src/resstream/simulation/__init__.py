"""resstream.simulation"""
