"""trainables"""
