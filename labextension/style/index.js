import './base.css';
import './hang.css';
