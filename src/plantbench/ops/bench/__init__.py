"""ops/bench"""
