"""truth"""
